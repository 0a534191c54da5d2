"""Models: Hub search with details and fit badges, the download queue, and the local library
(the Hugging Face cache, and model folders on this computer).

The consent to run a model's own code (trust_remote_code) is kept per model by the daemon
(``PUT /api/models/{repo}/trust``); the search details and the library both change it."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QSplitter, QTabWidget, QVBoxLayout, QWidget

from desktop.daemon.fixes import LIBRARY, LOCAL_FOLDER, Fix
from desktop.daemon.messages import CallResult
from desktop.dashboard.downloads_view import DownloadsView
from desktop.dashboard.folders_view import FoldersView
from desktop.dashboard.library_view import LibraryView
from desktop.dashboard.page import Page, PageContext
from desktop.dashboard.search_view import SearchView


class ModelsPage(Page):
    def __init__(self, ctx: PageContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self._loaded = False
        self.consents: dict[str, bool] = {}  # trust changes made here (also for models not local)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        self.tabs = QTabWidget()
        self.tabs.setObjectName("modelTabs")
        self.library = LibraryView(ctx, self.set_trust)
        self.search = SearchView(ctx, self.trusted, self.set_trust)
        self.downloads = DownloadsView(ctx)
        self.folders = FoldersView(ctx)
        self.tabs.addTab(self.search, "Search the Hub")
        self.tabs.addTab(self.downloads, "Downloads")
        self.shelf = QSplitter(Qt.Orientation.Vertical)
        self.shelf.setObjectName("libraryShelf")
        self.shelf.addWidget(self.library)
        self.shelf.addWidget(self.folders)
        self.shelf.setSizes([400, 250])
        self.tabs.addTab(self.shelf, "Library")
        layout.addWidget(self.tabs)
        ctx.state.connection_changed.connect(lambda _c: self._reload_if_shown())

    def trusted(self, repo_id: str) -> bool:
        return self.consents.get(repo_id, self.library.trusted(repo_id))

    def set_trust(self, repo_id: str, trust: bool) -> None:
        def done(result: CallResult) -> None:
            if result.ok:
                self.consents[repo_id] = trust
                if self.search.selected_repo() == repo_id:
                    self.search.on_result_selected()  # the code files join the download
                word = "may now run" if trust else "may no longer run"
                self.ctx.notifier.notify(
                    "info", "Model code", f"{repo_id} {word} its own code", popup=False
                )
            else:
                self.ctx.notifier.notify("error", "Changing the model's trust failed", result.error)
            self.library.reload()

        self.ctx.bridge.call(lambda c: c.trust_model(repo_id, trust), done)

    def show_library(self) -> None:
        self.tabs.setCurrentWidget(self.shelf)

    def show_fix(self, fix: Fix) -> None:
        if fix.action in (LOCAL_FOLDER, LIBRARY):
            self.show_library()
        if fix.action == LOCAL_FOLDER:
            self.folders.on_add_clicked()

    def page_shown(self) -> None:
        if not self._loaded:
            self._reload_if_shown(force=True)

    def _reload_if_shown(self, *, force: bool = False) -> None:
        if not (force or self.isVisible()) or not self.ctx.state.connected:
            return
        self._loaded = True
        self.search.load_access()
        self.downloads.reload()
        self.library.reload()
