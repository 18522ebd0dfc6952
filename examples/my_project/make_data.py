"""Write a small ordinal data set as ``data/ranks/<rank>/<n>.png`` (images of 1..4 shapes), offline."""

import sys
from pathlib import Path

from PIL import Image

from cloc_lightning.data import make_ordinal_shapes

n = int(sys.argv[1]) if len(sys.argv) > 1 else 400
images, labels = make_ordinal_shapes(n, num_classes=4, image_size=32, seed=0)
for i, (image, label) in enumerate(zip(images, labels.tolist(), strict=True)):
    folder = Path("data/ranks") / str(label)
    folder.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image.permute(1, 2, 0).numpy()).save(folder / f"{i}.png")
print(f"wrote {n} images to data/ranks/")
