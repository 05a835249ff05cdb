"""Building the networks from a folder: their configs and the safetensors loader."""
