"""Images in the chat: pasted, dropped or picked pictures become ``data:`` URLs (scaled so the
longest side is at most ``MAX_SIDE_PX``: a photo straight from a phone would not fit the chats
store's limit, and vision models work on small images anyway), the composer that accepts them,
the strip of pending thumbnails under it, and the thumbnails a stored message shows.
"""

from __future__ import annotations

import base64
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QMimeData, Qt, Signal
from PySide6.QtGui import QImage, QImageReader, QImageWriter, QPixmap
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPlainTextEdit, QToolButton, QWidget

MAX_SIDE_PX = 1536
MAX_IMAGES = 4  # as the chats store keeps at most
THUMB_PX = 72
IMAGE_FILES = "Images (*.png *.jpg *.jpeg *.webp *.gif *.bmp)"


def data_url(image: QImage) -> str:
    """``image`` as a PNG (when it has transparency) or JPEG ``data:`` URL, scaled down to at
    most ``MAX_SIDE_PX`` on its longest side."""
    if max(image.width(), image.height()) > MAX_SIDE_PX:
        image = image.scaled(
            MAX_SIDE_PX,
            MAX_SIDE_PX,
            Qt.AspectRatioMode.KeepAspectRatio,
            Qt.TransformationMode.SmoothTransformation,
        )
    kind = "png" if image.hasAlphaChannel() else "jpeg"
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    writer = QImageWriter(buffer, QByteArray(kind.encode()))
    writer.setQuality(90)
    writer.write(image)
    buffer.close()
    return f"data:image/{kind};base64,{base64.b64encode(data.data()).decode('ascii')}"


def read_image(path: Path) -> QImage | None:
    """The picture in the file at ``path``; None when it is not one Qt can read."""
    reader = QImageReader(str(path))
    reader.setAutoTransform(True)  # a phone photo's EXIF rotation
    image = reader.read()
    return None if image.isNull() else image


def thumbnail(url: str, size_px: int = THUMB_PX) -> QPixmap:
    """A small picture of a ``data:`` URL (an empty pixmap when it cannot be decoded)."""
    pixmap = QPixmap()
    _, _, payload = url.partition(",")
    try:
        pixmap.loadFromData(base64.b64decode(payload, validate=True))
    except ValueError:
        return QPixmap()
    if pixmap.isNull():
        return pixmap
    return pixmap.scaled(
        size_px,
        size_px,
        Qt.AspectRatioMode.KeepAspectRatio,
        Qt.TransformationMode.SmoothTransformation,
    )


def images_in(mime: QMimeData) -> list[QImage]:
    """The pictures a paste or drop carries: image data, or local image files."""
    if mime.hasImage():
        pasted = QImage(mime.imageData())
        return [] if pasted.isNull() else [pasted]
    found = []
    for url in mime.urls() if mime.hasUrls() else []:
        image = read_image(Path(url.toLocalFile())) if url.isLocalFile() else None
        if image is not None:
            found.append(image)
    return found


class ImageComposer(QPlainTextEdit):
    """The message box: text as before, and pictures pasted (Ctrl+V) or dropped onto it, which
    it hands on as ``image_added`` (a ``data:`` URL) instead of inserting anything."""

    image_added = Signal(str)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:
        return bool(images_in(source)) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:
        images = images_in(source)
        if not images:
            super().insertFromMimeData(source)
            return
        for image in images:
            self.image_added.emit(data_url(image))


class Thumbnails(QWidget):
    """A row of thumbnails; ``removable`` adds a × to each (the composer's pending images)."""

    changed = Signal()

    def __init__(self, *, removable: bool, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.removable = removable
        self.images: tuple[str, ...] = ()
        self.row = QHBoxLayout(self)
        self.row.setContentsMargins(0, 0, 0, 0)
        self.row.addStretch(1)
        self.setVisible(False)

    def set_images(self, images: tuple[str, ...]) -> None:
        self.images = images
        while self.row.count() > 1:
            item = self.row.takeAt(0)
            widget = item.widget() if item is not None else None
            if widget is not None:
                widget.deleteLater()
        for index, url in enumerate(images):
            self.row.insertWidget(index, self._tile(index, url))
        self.setVisible(bool(images))
        self.changed.emit()

    def add(self, url: str) -> bool:
        """Add one more (False when it already holds ``MAX_IMAGES``)."""
        if len(self.images) >= MAX_IMAGES:
            return False
        self.set_images((*self.images, url))
        return True

    def clear(self) -> None:
        self.set_images(())

    def _tile(self, index: int, url: str) -> QWidget:
        tile = QWidget()
        layout = QHBoxLayout(tile)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        picture = QLabel()
        picture.setObjectName("imageThumb")
        picture.setPixmap(thumbnail(url))
        picture.setToolTip(f"image {index + 1} ({len(url) * 3 // 4 // 1024:,} KiB)")
        layout.addWidget(picture)
        if self.removable:
            remove = QToolButton()
            remove.setText("×")
            remove.setObjectName("removeImage")
            remove.setToolTip("Leave this image out")
            remove.setAutoRaise(True)
            remove.clicked.connect(lambda: self._remove(index))
            layout.addWidget(remove, 0, Qt.AlignmentFlag.AlignTop)
        return tile

    def _remove(self, index: int) -> None:
        self.set_images(self.images[:index] + self.images[index + 1 :])
