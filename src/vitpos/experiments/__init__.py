"""One claim of the study per module; each talks to models only through the surface."""
