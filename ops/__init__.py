"""Operations: health checks, Prometheus metrics and logs."""
