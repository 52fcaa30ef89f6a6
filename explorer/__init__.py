"""The Streamlit explorer (``app.py``): inputs and URL state, charts, pages."""
