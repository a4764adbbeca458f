"""The conversation engine: whole duplex conversations, many per device, every stage batched (api.py)."""
