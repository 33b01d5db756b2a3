"""The size every committed plot is drawn at, so that its fonts are read on the site at about
the size they are set in."""

from __future__ import annotations

__all__ = ["PLOT_FONT_PT", "PLOT_WIDTH_IN"]

PLOT_WIDTH_IN = 7.0
"""The plots' width in inches: about the width the site's pages show them at (700 CSS pixels),
so their fonts are shown at about the size they are set in."""

PLOT_FONT_PT = 11.0
"""The smallest font in the plots, in points at :data:`PLOT_WIDTH_IN`."""
