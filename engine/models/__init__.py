"""Plain (single-process, no distributed code) reference models; engine.parallel_gpt parallelizes GPT."""
