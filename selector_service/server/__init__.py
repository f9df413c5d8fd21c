"""Running the service: the FastAPI app (app.py), the command line (cli.py), the embedded Valkey it
starts without a store URL (embedded.py), children that die with it (lifetime.py), a store lost at
start-up (startup.py), and the one launcher that starts `serve` in a child process (launcher.py)."""
