"""What a person sees in the notebook: the magic, the live dashboard, the static ending, the comparison
widget, --tune's view, the status, the session; what they show is rendered by ``render/``.

Runs in the kernel.
"""
