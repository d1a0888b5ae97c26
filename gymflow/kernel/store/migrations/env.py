"""Alembic environment: runs on the connection `migrate()` hands in (it holds the advisory lock)."""

from alembic import context

from gymflow.kernel.store.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata)
with context.begin_transaction():
    context.run_migrations()
