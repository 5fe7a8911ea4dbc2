"""What every long-running hookbus process shares: the FastStream app on one broker, the
services' defaults, the event loop, and a small thread pool for CPU-heavy steps."""
