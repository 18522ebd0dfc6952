"""Packaging tests: the built sdist and wheel, installed into a fresh venv."""
