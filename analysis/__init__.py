"""tgsim.analysis: statistical checks of the codecs' claims (installed from `analysis/`)."""
