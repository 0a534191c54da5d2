"""Batches (engines/batch/, OpenAI's Batch API at the gateway), every caller's, through the
control API; follow one with ``events(kinds=("batch",))``: BatchProgress while it runs,
BatchFinished at its end. A batch is OpenAI's Batch object, as a plain mapping."""

from __future__ import annotations

from engines.client.base import JSON, ClientBase, api_path


class BatchCalls(ClientBase):
    async def batches_list(self, limit: int = 100) -> list[JSON]:
        """Every caller's batches, newest first."""
        data: list[JSON] = await self._call("GET", "/api/batches", params={"limit": str(limit)})
        return data

    async def batch(self, batch_id: str) -> JSON:
        data: JSON = await self._call("GET", api_path("/api/batches/{}", batch_id))
        return data

    async def batch_cancel(self, batch_id: str) -> JSON:
        """Stop a batch; what finished is kept in its output and error files."""
        data: JSON = await self._call(
            "POST", api_path("/api/batches/{}/cancel", batch_id), timeout_s=60
        )
        return data
