"""`tidal dashboard RUN_DIRS...`: a local web app over run folders and eval folders
(docs/design/dashboard.md). data.py reads the folders, plots.py draws inline SVG, pages.py renders
server-side HTML (every piece of stored text escaped), app.py serves it with Starlette."""
