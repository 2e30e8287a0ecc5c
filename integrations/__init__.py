"""Other services' calls into this one: GitHub's secret-scanning reports of leaked keys."""
