"""Chats: the chat window's conversations (store.py), the feature (service.py), /api/chats
(routes.py)."""
