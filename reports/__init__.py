"""Reports rendered from history alone: Markdown, HTML with plots, deploy artifacts."""
