"""The boards between processes: the CPU cores lent between the models, and each stream's state."""
