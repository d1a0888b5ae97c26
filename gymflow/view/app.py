"""`gymflow view`'s routes (aiohttp). Every handler only reads. Rollout ids hold '/', so links percent-encode
them and the routes take the rest of the path.

Pages carry a Content-Security-Policy that runs only this package's inline script (by nonce) and loads nothing
from elsewhere: model output is escaped by the templates, and even a missed spot could not run a script."""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession

from gymflow.kernel.store import reviews
from gymflow.kernel.store.db import make_engine, make_sessionmaker
from gymflow.reports.data import Linker
from gymflow.view import fragments, pages
from gymflow.view import review as review_side
from gymflow.view.render import NONCE

log = logging.getLogger(__name__)
ENGINE = web.AppKey("engine", object)
SESSIONS = web.AppKey("sessions", object)
CACHE = web.AppKey("cache", fragments.Cache)
LINKER = web.AppKey("linker", object)
FORM_TOKEN = web.AppKey("form_token", str)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _csp(nonce: str) -> str:
    return (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; img-src 'self' data:; "
            "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


def _html(body: str, status: int = 200) -> web.Response:
    return web.Response(text=body, status=status, content_type="text/html", charset="utf-8")


@web.middleware
async def _headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    nonce = secrets.token_urlsafe(16)
    NONCE.set(nonce)  # each request runs in its own task, so its own context
    try:
        response = await handler(request)
    except (OperationalError, DBAPIError) as e:
        log.warning("store query failed: %s", e)
        response = _html(pages.page("error.html", message=f"the run store did not answer: {type(e.orig).__name__}"),
                         status=503)
    response.headers.setdefault("Content-Security-Policy", _csp(nonce))
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers.setdefault("Cache-Control", "no-store")
    return response


def _session(request: web.Request) -> AsyncSession:
    return request.app[SESSIONS]()


async def runs(request: web.Request) -> web.Response:
    async with _session(request) as s:
        return _html(await pages.runs_page(s))


async def run(request: web.Request) -> web.Response:
    run_id = request.match_info["run"]
    async with _session(request) as s:
        body = await pages.run_page(s, run_id, request.query, request.app[CACHE])
        if body is None:
            return _html(await pages.not_found_page(s, "run", run_id), status=404)
    return _html(body)


async def plot(request: web.Request) -> web.Response:
    run_id, name = request.match_info["run"], request.match_info["name"]
    if name not in fragments.PLOTS:
        raise web.HTTPNotFound(text=f"no plot {name!r}; plots: {', '.join(fragments.PLOTS)}")
    async with _session(request) as s:
        svgs = await fragments.plots_of(request.app[CACHE], s, run_id)
    if svgs is None:
        raise web.HTTPNotFound(text=f"no run {run_id!r}")
    # An SVG opened on its own is a document: no script in it may run either.
    return web.Response(text=svgs[name], content_type="image/svg+xml",
                        headers={"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'"})


async def health(request: web.Request) -> web.Response:
    run_id = request.match_info["run"]
    async with _session(request) as s:
        checks = await fragments.checks_of(request.app[CACHE], s, run_id)
        if checks is None:
            return _html(await pages.not_found_page(s, "run", run_id), status=404)
    return _html(pages.health_fragment(checks))


async def details(request: web.Request) -> web.Response:
    run_id = request.match_info["run"]
    async with _session(request) as s:
        if await pages.run_exists(s, run_id):
            return _html(await fragments.details_of(request.app[CACHE], s, run_id))
        return _html(await pages.not_found_page(s, "run", run_id), status=404)


async def rollout(request: web.Request, problem: str | None = None, form: dict[str, str] | None = None
                  ) -> web.Response:
    rid = request.match_info["rid"]
    page_no = _int(request.query.get("page"), 1)
    async with _session(request) as s:
        body = await pages.rollout_page(s, rid, page_no, request.app[LINKER], form_token=request.app[FORM_TOKEN],
                                        review_problem=problem, form=form)
        if body is None:
            return _html(await pages.not_found_page(s, "rollout", rid), status=404)
    return _html(body, status=400 if problem else 200)


async def post_review(request: web.Request) -> web.StreamResponse:
    """A label from the rollout page's form; back to the page (the form again, with the problem, if refused)."""
    rid = request.match_info["rid"]
    form = {k: str(v) for k, v in (await request.post()).items()}
    if not secrets.compare_digest(form.get("token", ""), request.app[FORM_TOKEN]):
        return _html(pages.page("error.html", message="the form is stale or not this server's: reload the page"),
                     status=403)
    try:
        label = review_side.label_from_form(rid, form)
        async with _session(request) as s:
            await review_side.add(s, label)
    except reviews.ReviewError as e:
        return await rollout(request, problem=str(e), form=form)
    except LookupError:
        async with _session(request) as s:
            return _html(await pages.not_found_page(s, "rollout", rid), status=404)
    raise web.HTTPSeeOther(f"{request.path.removesuffix('/review')}#review")


async def agreement(request: web.Request) -> web.Response:
    run_id = request.match_info["run"]
    try:
        threshold = float(request.query.get("threshold", "1"))
    except ValueError:
        threshold = 1.0
    async with _session(request) as s:
        if not await pages.run_exists(s, run_id):
            return _html(await pages.not_found_page(s, "run", run_id), status=404)
        rows = await review_side.agreement(s, run_id, threshold)
    return _html(pages.page("agreement.html", run_id=run_id, rows=rows, threshold=threshold))


async def tokens(request: web.Request) -> web.Response:
    rid, turn = request.match_info["rid"], _int(request.query.get("turn"), -1)
    async with _session(request) as s:
        data = await pages.turn_tokens(s, rid, turn)
    if data is None:
        return web.json_response({"error": f"no turn {turn} of rollout {rid!r}"}, status=404)
    return web.json_response(data, dumps=_dumps)


async def text(request: web.Request) -> web.Response:
    rid, field = request.match_info["rid"], request.match_info["field"]
    async with _session(request) as s:
        value = await pages.message_text(s, rid, int(request.match_info["index"]), field)
    if value is None:
        raise web.HTTPNotFound(text=f"no {field} of message {request.match_info['index']} of rollout {rid!r}")
    # text/plain and nosniff: a browser shows the model's text as text, never as a page.
    return web.Response(text=value, content_type="text/plain", charset="utf-8")


async def live(request: web.Request) -> web.Response:
    rid = request.match_info["rid"]
    async with _session(request) as s:
        data = await pages.live_state(s, rid)
    if data is None:
        return web.json_response({"error": f"no rollout {rid!r}"}, status=404)
    return web.json_response(data, dumps=_dumps)


def _dumps(value: Any) -> str:
    import json

    return json.dumps(value, default=str, ensure_ascii=False)


def _int(raw: str | None, default: int) -> int:
    try:
        return int(raw) if raw is not None else default
    except ValueError:
        return default


def make_app(database_url: str, linker: Linker, *, pool_size: int = 4) -> web.Application:
    """The view's application on the store at `database_url`; `linker` gives a rollout's Temporal UI page."""
    app = web.Application(middlewares=[_headers])
    app[CACHE] = fragments.Cache()
    app[LINKER] = linker
    app[FORM_TOKEN] = secrets.token_urlsafe(24)

    async def store(app: web.Application) -> AsyncIterator[None]:
        engine = make_engine(database_url, pool_size=pool_size)
        app[ENGINE], app[SESSIONS] = engine, make_sessionmaker(engine)
        yield
        await engine.dispose()

    app.cleanup_ctx.append(store)
    app.router.add_get("/", runs)
    app.router.add_get("/runs/{run}", run)
    app.router.add_get("/runs/{run}/plots/{name}.svg", plot)
    app.router.add_get("/runs/{run}/health", health)
    app.router.add_get("/runs/{run}/details", details)
    app.router.add_get("/runs/{run}/review", agreement)
    # Most specific first: a rollout id ends with its sample number, never with these words.
    app.router.add_get(r"/rollouts/{rid:.+}/tokens", tokens)
    app.router.add_get(r"/rollouts/{rid:.+}/text/{index:\d+}/{field}", text)
    app.router.add_get(r"/rollouts/{rid:.+}/live", live)
    app.router.add_post(r"/rollouts/{rid:.+}/review", post_review)
    app.router.add_get(r"/rollouts/{rid:.+}", rollout)
    return app
