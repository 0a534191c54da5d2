"""chats"""
