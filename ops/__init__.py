"""Operations: health checks, Prometheus metrics, logs, client addresses, background services' start and stop."""
