"""Figures' look and checks shared by `tgsim plot` and the figure scripts (papers_figures/): the seaborn
theme (`theme`) and the layout check (`layout.check_layout`) every written figure passes."""
