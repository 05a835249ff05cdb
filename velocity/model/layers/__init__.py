"""The layers the networks are built of: paged attention in torch, output heads, int8 and packed
float32 linears."""
