"""Suite directories (`kerneltrial suite`): suite.json, its verify checks and the suite's report.md."""
