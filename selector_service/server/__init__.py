"""Running the service: the FastAPI app (app.py), the command line (cli.py), the embedded Valkey it
starts without a store URL (embedded.py), children that die with it (lifetime.py), and a store lost at
start-up (startup.py). What starts `serve` in a child process is selector_service/launcher.py, below every
layer (the demo, the replay, the benchmarks and the tests use it)."""
