"""`ctxlab lab`: serve the interactive lab page on loopback and print its URL."""

from __future__ import annotations

import typer

from ctxlab.errors import CtxlabError


def register(app: typer.Typer) -> None:
    @app.command("lab")
    def lab(
        port: int = typer.Option(8765, "--port", help="TCP port; 0 picks a free one."),
        host: str = typer.Option(
            "127.0.0.1",
            "--host",
            help="Address to bind; the default serves only this machine (loopback).",
        ),
    ) -> None:
        """Serve a local page over the planner: four figures, what moved, and why."""
        from ctxlab.lab.server import make_server, server_url

        if not 0 <= port <= 65535:
            raise CtxlabError(f"port must be between 0 and 65535, got {port}")
        try:
            server = make_server(host, port)
        except OSError as exc:
            raise CtxlabError(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from None
        typer.echo(f"ctxlab lab: serving on {server_url(server)} (Ctrl-C stops it)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            typer.echo("ctxlab lab: stopped")
        finally:
            server.server_close()
