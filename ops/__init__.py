"""Operations: health checks, Prometheus metrics, logs, client addresses, and the start and stop of background services."""
