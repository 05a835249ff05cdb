"""What the Triton models share: settings and request validation."""
