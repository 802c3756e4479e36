"""Each algorithm's config section and presets, importable without torch (``recipes/<algo>.py --help``)."""
