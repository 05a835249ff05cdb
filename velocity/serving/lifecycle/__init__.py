"""The server's life: the drain on stop, the watchdog of its parts, the health port, a stub's exit."""
