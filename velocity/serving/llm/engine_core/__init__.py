"""The llm's engine core in a process of its own (as vLLM V1's EngineCore): the scheduler, the
model runner, the sampler and each stream's chunking run there with their own GIL, and the llm
stub only parses requests, forwards stops and progress, and sends responses.

    wire     the messages each way and the socket they go over
    stream   one request in the core: its sentences as engine requests, cut into chunks
    core     the core's loop: commands in, a step, one message out
    client   the stub's side: starts the process, sends commands, receives the messages
    __main__ the process: python -m velocity.serving.llm.engine_core --fd N
"""
