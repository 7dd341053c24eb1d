"""The figure scripts (Jupyter-style, one per figure): run them as scripts, `python papers_figures/NAME.py`
from a checkout or `tgsim figures NAME` from an installed package; importing this package runs nothing."""
