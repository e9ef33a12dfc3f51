"""One function per panel; dashboards compose them (``infersight.dashboards.oncall`` ...)."""
