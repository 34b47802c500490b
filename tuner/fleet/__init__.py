"""A study searched by several GPUs: one worker process per GPU, owned from start to stop, and what each worker does
on its GPU."""
