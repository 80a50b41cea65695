"""ctxlab: measure what long context costs and what it keeps."""

__version__ = "0.1.0"
