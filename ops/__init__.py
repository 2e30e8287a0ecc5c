"""Operations: health checks, Prometheus metrics, logs, and the start and stop of background services."""
