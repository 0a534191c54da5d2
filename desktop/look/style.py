"""The windows' own style rules (desktop/look/theme.py puts them after the shared components).
Colours are translucent so they read on light and dark themes."""

STYLE = """
QFrame#message-user {
    background: rgba(25, 113, 194, 0.10);
    border: 1px solid rgba(25, 113, 194, 0.30);
    border-radius: 8px;
}
QFrame#message-assistant, QFrame#message-system {
    background: rgba(127, 127, 127, 0.06);
    border: 1px solid rgba(127, 127, 127, 0.30);
    border-radius: 8px;
}
QFrame[leftOut="true"] {
    border: 1px dashed rgba(127, 127, 127, 0.45);
    background: transparent;
}
QFrame[leftOut="true"] QLabel, QLabel#leftOutNote {
    color: palette(placeholder-text);
}
QLabel#messageStats, QLabel#codeLanguage, QLabel#chatStatus {
    color: palette(placeholder-text);
}
QFrame#codeBlock {
    background: rgba(127, 127, 127, 0.10);
    border: 1px solid rgba(127, 127, 127, 0.35);
    border-radius: 6px;
}
QFrame#codeBlock QPlainTextEdit {
    background: transparent;
    border: none;
}
QFrame#errorCard {
    background: rgba(214, 40, 40, 0.08);
    border: 1px solid #d62828;
    border-radius: 6px;
}
QFrame#connectionBanner[level="error"] {
    background: rgba(214, 40, 40, 0.14);
    border-bottom: 1px solid #d62828;
}
QFrame#connectionBanner[level="info"] {
    background: rgba(25, 113, 194, 0.12);
    border-bottom: 1px solid #1971c2;
}
QLabel#fallbackNote, QFrame#editNote, QLabel#imageNote {
    background: rgba(242, 183, 5, 0.18);
    border: 1px solid rgba(242, 183, 5, 0.7);
    border-radius: 4px;
    padding: 6px;
}
QFrame#unavailableCard {
    border: 2px dashed rgba(127, 127, 127, 0.6);
    border-radius: 10px;
    padding: 18px;
}
QLabel#unavailableBadge {
    background: rgba(242, 183, 5, 0.25);
    border: 1px solid #e0a100;
    border-radius: 4px;
    padding: 3px 10px;
    font-weight: bold;
}
QLabel#placeholder {
    color: palette(placeholder-text);
    padding: 40px;
}
QFrame#gpuCard {
    border: 1px solid rgba(127, 127, 127, 0.45);
    border-radius: 8px;
}
QFrame#gpuCard[guard="hot"] {
    border: 2px solid #d62828;
    background: rgba(214, 40, 40, 0.05);
}
QLabel#simBadge, QLabel#guardBadge, QLabel#badge {
    border-radius: 4px;
    padding: 2px 8px;
    font-weight: bold;
}
QLabel#simBadge {
    background: rgba(242, 183, 5, 0.35);
    border: 1px solid #e0a100;
}
QLabel#guardBadge {
    background: rgba(214, 40, 40, 0.18);
    border: 1px solid #d62828;
}
QLabel#gpuSource {
    padding: 6px;
    border-radius: 4px;
}
QLabel#gpuSource[kind="simulated"] {
    background: rgba(242, 183, 5, 0.25);
    border: 1px solid #e0a100;
    font-size: 11pt;
}
QLabel#gpuSource[kind="unknown"] {
    background: rgba(127, 127, 127, 0.12);
    border: 1px solid rgba(127, 127, 127, 0.5);
}
QLabel#factKey, QLabel#gpuIds {
    color: palette(placeholder-text);
}
QLabel#helperHint {
    background: rgba(25, 113, 194, 0.08);
    border: 1px solid rgba(25, 113, 194, 0.4);
    border-radius: 4px;
    padding: 6px;
}
QPushButton#copyMessage, QPushButton#editMessage, QPushButton#regenerateMessage {
    padding: 1px 6px;
    color: palette(link);
}
"""
