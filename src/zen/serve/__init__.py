"""`zen serve`: the Base Model Library as a team's HTTP API (FastAPI + uvicorn), above zen.library."""
