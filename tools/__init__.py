"""Stand-ins for the other side of the service, run by hand to try it on your own machine: a
webhook receiver (docs/webhooks.md) and GitHub's secret scanning (docs/leaked-keys.md)."""
