"""The layout check of every figure, `check_layout(fig)` and LayoutError: tgsim.plotting.layout (in the
package, so that `tgsim plot` runs the same check), imported here by the bare name the figure
scripts use (`from _layout import check_layout`)."""

from __future__ import annotations

from tgsim.plotting.layout import *  # noqa: F401,F403
from tgsim.plotting.layout import LayoutError, check_layout  # noqa: F401
