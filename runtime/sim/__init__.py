"""The simulated SGLang: a real HTTP server that behaves like SGLang on a described card."""
