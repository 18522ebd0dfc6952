"""A project of one's own on cloc-lightning: a new ordinal loss and a new data module (docs/extending.md, the tutorial)."""
