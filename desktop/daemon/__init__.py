"""The app's side of the daemon: the asyncio link on the bridge's loop, the state the GUI
thread keeps of it (engines, GPUs, library), what the app can ask of it, and its words."""
