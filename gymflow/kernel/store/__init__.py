"""Postgres store: typed SQLAlchemy 2.0 models, alembic migrations, idempotent writes."""
