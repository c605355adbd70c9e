"""alloc-audit: a static census of GPU memory allocation sites, their lifetime
tiers and the hazards around them, for Python/C++/CUDA inference engines."""

__version__ = "0.2.0"
