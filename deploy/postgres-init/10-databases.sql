-- Runs once, when the postgres container starts on an empty data volume
-- (docker-entrypoint-initdb.d, as the superuser, psql 16).
--
-- gymflow's results live in their own database and role, apart from Temporal's databases:
--   gymflow               owned by role gymflow  (alembic migrations run by the env/generate pools)
--   temporal              owned by role temporal (schema set up by temporalio/auto-setup)
--   temporal_visibility   created by auto-setup as role temporal (needs CREATEDB)
-- The password is read from the container's environment, never written here.

\set ON_ERROR_STOP on
\getenv pw POSTGRES_PASSWORD

CREATE ROLE temporal LOGIN CREATEDB PASSWORD :'pw';
-- auto-setup skips CREATE DATABASE when the database is named like its user, so create it here.
CREATE DATABASE temporal OWNER temporal;

CREATE ROLE gymflow LOGIN PASSWORD :'pw';
CREATE DATABASE gymflow OWNER gymflow;
REVOKE ALL ON DATABASE gymflow FROM PUBLIC;

-- Temporal's postgres12 visibility schema uses btree_gin. It is a trusted extension, so the owner of
-- temporal_visibility may create it, but having it in template1 makes that independent of the role.
\connect template1
CREATE EXTENSION IF NOT EXISTS btree_gin;
