"""Images in the chat through the real app and the real daemon: a picture
pasted into the composer goes to a model whose config.json describes a vision encoder as an
OpenAI ``image_url`` content part, is stored with the message and shown as a thumbnail; a
text-only model is not sent it, and the chat says why."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from PySide6.QtCore import QMimeData, Qt
from PySide6.QtGui import QColor, QImage

from desktop.chat.images import MAX_SIDE_PX, THUMB_PX, data_url, thumbnail
from desktop.daemon.gateway import ChatRequest
from tests.desktop.conftest import ThreadedDaemon


def _vision_profile(d: ThreadedDaemon, folder: Path) -> None:
    """A FAKE engine serving a model folder whose config.json is a LLaVA one."""
    folder.mkdir()
    config = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
              "vision_config": {"model_type": "clip_vision_model"}}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    d.write_profile("see", model=str(folder), served_name="see", device="cpu",
                    env={"FAKE_ENGINE_ARGS": ""})  # fmt: skip


def _picture(width: int = 64, height: int = 48) -> QImage:
    image = QImage(width, height, QImage.Format.Format_RGB32)
    image.fill(QColor("#2a9d8f"))
    return image


def test_a_pasted_image_goes_to_a_vision_model_and_not_to_a_text_one(
    qtbot, app, daemon_thread, tmp_path: Path
) -> None:
    d = daemon_thread
    _vision_profile(d, tmp_path / "llava-folder")
    d.write_fake_profile("text")
    app.actions.start_profile("see")
    qtbot.waitUntil(lambda: "see" in app.state.served_models(), timeout=20000)
    chat = app.open_chat("")
    app.actions.reload_profiles()  # a new profile: the app hears of it
    qtbot.waitUntil(lambda: {"text", "see"} <= set(app.state.servable), timeout=10000)
    servable = app.state.servable
    assert servable["see"].accepts_images and not servable["text"].accepts_images
    mime = QMimeData()
    mime.setImageData(_picture())
    assert chat.composer.canInsertFromMimeData(mime)
    chat.composer.insertFromMimeData(mime)  # as Ctrl+V does
    assert len(chat.pending.images) == 1 and chat.pending.isVisibleTo(chat)
    assert chat.pending.images[0].startswith("data:image/jpeg;base64,")
    assert chat.composer.toPlainText() == ""  # the picture is not pasted as text
    assert not chat.image_note.isVisibleTo(chat)  # "see" is picked: it takes images

    # a text-only model: nothing is sent or stored, the chat says why, the picture stays
    chat.select_model("text")
    chat.composer.setFocus()
    qtbot.keyClicks(chat.composer, "What colour is this?")  # typing keeps the note that says why
    assert chat.image_note.isVisibleTo(chat)
    assert "text does not take images" in chat.image_note.text()
    qtbot.keyClick(chat.composer, Qt.Key.Key_Return)  # Enter: refused, and says why
    qtbot.waitUntil(lambda: chat.transcript.error_card.isVisible())
    error = chat.controller.last_error
    assert error is not None and error.kind == "images_not_accepted"
    assert "text does not take images" in error.message and "vision model" in error.message
    assert chat.controller.transcript is None and chat.controller.streaming is None
    assert len(chat.pending.images) == 1 and chat.composer.toPlainText()

    # the vision model: sent, stored with the message, shown as a thumbnail
    chat.select_model("see")
    assert not chat.image_note.isVisibleTo(chat)
    chat.on_send_clicked()
    qtbot.waitUntil(lambda: chat.controller.transcript is not None, timeout=10000)
    qtbot.waitUntil(lambda: chat.controller.streaming is None, timeout=20000)
    assert not chat.pending.images and not chat.transcript.error_card.isVisible()
    t = chat.controller.transcript
    stored = d.run(lambda c: c.chat(t.chat.chat_id)).messages
    assert stored[0].content == "What colour is this?" and len(stored[0].images) == 1
    view = chat.transcript.messages[0]
    assert view.images.isVisibleTo(view) and len(view.images.images) == 1
    rows: list[dict[str, object]] = []

    def recorded() -> bool:  # the flight recorder writes a request once it has ended
        rows[:] = d.run(lambda c: c.requests_list(model="see"))
        return bool(rows)

    qtbot.waitUntil(recorded, timeout=10000)
    body = json.loads(d.run(lambda c: c.request_detail(rows[0]["id"]))["request_body"])
    content = body["messages"][-1]["content"]
    assert content[0] == {"type": "text", "text": "What colour is this?"}
    assert content[1]["type"] == "image_url"
    assert content[1]["image_url"]["url"] == stored[0].images[0]


def test_big_pictures_are_scaled_down_and_text_stays_plain() -> None:
    url = data_url(_picture(4000, 3000))
    sent = QImage.fromData(base64.b64decode(url.partition(",")[2]))
    assert (sent.width(), sent.height()) == (MAX_SIDE_PX, MAX_SIDE_PX * 3 // 4)
    assert max(thumbnail(url).width(), thumbnail(url).height()) == THUMB_PX
    plain = ChatRequest(1, "m", (("user", "hi", ()),), 0.7, 1.0, 16).payload()
    assert plain["messages"] == [{"role": "user", "content": "hi"}]
