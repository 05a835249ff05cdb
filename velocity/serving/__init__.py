"""What the Triton models share (docs/architecture.md, "4. Serving"): the settings; the request
table and the readers of each model's requests; the protocol between the models; the llm's
requests in flight; the vocoder's queue; the metrics; the core and stream boards; the drain; the
health port and its watchdog."""
