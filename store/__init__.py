"""Storage helpers: the rate-limit storages, schema upgrades, write transactions and short locks."""
