"""OpenAI's Files API at the gateway (uploads for batches), stored under the data folder."""
