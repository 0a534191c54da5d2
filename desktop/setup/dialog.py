"""The first-run setup window: from nothing to a chat answer in four cards (this computer, the
engine, a model, start and chat). "Set it all up" runs every missing step in turn; each card says
what is happening with its progress, and an error stops there with the button that fixes it and
the CLI command as a hint. Opened on the first run, from the tray ("Set up traylm…") and from
Settings. The logic lives in desktop/setup/flow.py.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import (
    QButtonGroup,
    QDialog,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from desktop.daemon.actions import Actions
from desktop.daemon.bridge import Bridge
from desktop.daemon.fixes import INSTALL_ENGINE, LOCAL_FOLDER, Fix
from desktop.daemon.messages import CallResult
from desktop.daemon.state import AppState
from desktop.look.theme import SPACE_L, SPACE_M, primary
from desktop.setup.cards import ProposalRow, StepCard
from desktop.setup.flow import OFFLINE_CODES, STEPS, SetupFlow
from desktop.widgets.folder import ChooseFolder, ask_for_folder, start_dir
from desktop.widgets.sizing import resize_within_screen

TITLES = {
    "hardware": "This computer",
    "engine": "The engine",
    "model": "A model",
    "start": "Start it and chat",
}


class SetupDialog(QDialog):
    def __init__(
        self,
        bridge: Bridge,
        state: AppState,
        actions: Actions,
        *,
        open_chat: Callable[[str], object],
        run_fix: Callable[[Fix], None],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("setupDialog")
        self.setWindowTitle("Set up traylm")
        self.state = state
        self.app_actions = actions
        self.run_fix = run_fix
        self.choose_folder: ChooseFolder = ask_for_folder  # tests answer for the user
        self.flow = SetupFlow(bridge, state, actions, open_chat)
        self.rows: dict[str, ProposalRow] = {}
        self._rows_for: tuple[str, ...] = ()
        self.cards: dict[str, StepCard] = {}
        self._build()
        self.flow.changed.connect(self.refresh)
        self.flow.completed.connect(self.refresh)
        resize_within_screen(self, 720, 760)

    # ----------------------------------------------------------------- layout

    def _build(self) -> None:
        outer = QVBoxLayout(self)
        outer.setContentsMargins(SPACE_L, SPACE_L, SPACE_L, SPACE_M)
        title = QLabel("From nothing to a chat answer")
        title.setProperty("role", "title")
        outer.addWidget(title)
        intro = QLabel(
            "traylm looks at this computer, installs the engine that suits it, proposes a model "
            "that fits, starts it and opens the chat. Nothing here needs a terminal."
        )
        intro.setProperty("role", "muted")
        intro.setWordWrap(True)
        outer.addWidget(intro)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        inner = QWidget()
        column = QVBoxLayout(inner)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(SPACE_M)
        for number, step in enumerate(STEPS, start=1):
            card = StepCard(number, TITLES[step], self.on_fix, partial(self.flow.retry, step))
            card.setObjectName(f"step-{step}")
            self.cards[step] = card
            column.addWidget(card)
        column.addStretch(1)
        scroll.setWidget(inner)
        outer.addWidget(scroll, 1)
        self._hardware_extras()
        self._engine_extras()
        self._model_extras()
        outer.addLayout(self._buttons())

    def _hardware_extras(self) -> None:
        self.simulate_button = QPushButton("Explore the GPU pages with two simulated RTX 4090s")
        self.simulate_button.setObjectName("setupSimulate")
        self.simulate_button.setToolTip(
            "Turns on the GPU simulator (Settings) and restarts the daemon: the GPU, fan and "
            "power pages then show simulated cards. Models still run on the CPU."
        )
        self.simulate_button.clicked.connect(self.on_simulate_clicked)
        row = QHBoxLayout()
        row.addWidget(self.simulate_button)
        row.addStretch(1)
        self.cards["hardware"].extra.addLayout(row)

    def _engine_extras(self) -> None:
        self.cancel_install_button = QPushButton("Cancel the install")
        self.cancel_install_button.setObjectName("setupCancelInstall")
        self.cancel_install_button.setToolTip(
            "Nothing is left behind: the unfinished environment is removed"
        )
        self.cancel_install_button.clicked.connect(self.flow.cancel_install)
        row = QHBoxLayout()
        row.addWidget(self.cancel_install_button)
        row.addStretch(1)
        self.cards["engine"].extra.addLayout(row)

    def _model_extras(self) -> None:
        self.offline = QLabel("")
        self.offline.setObjectName("setupOffline")
        self.offline.setWordWrap(True)
        self.offline.setStyleSheet("color: #d62828;")
        self.proposal_column = QVBoxLayout()
        self.group = QButtonGroup(self)
        self.group.buttonClicked.connect(self.on_proposal_clicked)
        self.browse_button = QPushButton("Use a model folder on this computer…")
        self.browse_button.setObjectName("setupBrowse")
        self.browse_button.clicked.connect(self.on_browse_clicked)
        row = QHBoxLayout()
        row.addWidget(self.browse_button)
        row.addStretch(1)
        extra = self.cards["model"].extra
        extra.addWidget(self.offline)
        extra.addLayout(self.proposal_column)
        extra.addLayout(row)

    def _buttons(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.skip_button = QPushButton("Skip for now")
        self.skip_button.setObjectName("setupSkip")
        self.skip_button.setToolTip("Settings → Run the setup again brings this back")
        self.skip_button.clicked.connect(self.on_skip_clicked)
        row.addWidget(self.skip_button)
        row.addStretch(1)
        self.go_button = primary(QPushButton("Set it all up"))
        self.go_button.setObjectName("setupGo")
        self.go_button.clicked.connect(self.on_go_clicked)
        row.addWidget(self.go_button)
        return row

    # ----------------------------------------------------------------- state → widgets

    def begin(self) -> None:
        self.flow.begin()
        self.refresh()

    def refresh(self) -> None:
        for step, card in self.cards.items():
            card.show_view(self.flow.view(step))
        self._refresh_proposals()
        no_gpu = self.state.real_gpus == 0 and not self.state.gpu.simulated
        self.simulate_button.setVisible(no_gpu and self.state.connected)
        self.cancel_install_button.setVisible(self.state.install is not None)
        flow = self.flow
        if flow.done:
            self.go_button.setText("Close")
            self.go_button.setEnabled(True)
        elif flow.auto and not flow.errors:
            self.go_button.setText("Setting up…")
            self.go_button.setEnabled(False)
        else:
            self.go_button.setText("Set it all up" if not flow.auto else "Continue")
            self.go_button.setEnabled(self.state.connected and flow.choice is not None)

    def _refresh_proposals(self) -> None:
        flow = self.flow
        names = tuple(p.name for p in flow.proposals)
        if names != self._rows_for:
            self._rows_for = names
            for row in self.rows.values():
                self.group.removeButton(row.radio)
                row.deleteLater()
            self.rows = {}
            for proposal in flow.proposals:
                row = ProposalRow(proposal)
                self.group.addButton(row.radio)
                self.proposal_column.addWidget(row)
                self.rows[proposal.name] = row
        for name, row in self.rows.items():
            code, error = flow.fit_errors.get(name, ("", ""))
            row.show_fit(flow.fits.get(name), error, offline=code in OFFLINE_CODES)
            row.radio.setChecked(flow.choice is not None and flow.choice.name == name)
        checked = self.group.checkedButton()
        if flow.choice is None and checked is not None:
            self.group.setExclusive(False)  # an exclusive group keeps one checked: none is
            checked.setChecked(False)
            self.group.setExclusive(True)
            row.setEnabled(not flow.auto or bool(flow.errors))
        if flow.offline:
            self.offline.setText(
                "The Hugging Face Hub cannot be reached (no network?): downloads will fail. "
                "Use a model folder on this computer, or come back when online."
            )
        self.offline.setVisible(flow.offline)
        if not flow.proposals:
            self.cards["model"].text.setText(
                "No preset fits these GPUs: use a model folder, or search the Hub on the Models "
                "page."
            )

    # ----------------------------------------------------------------- actions

    def on_go_clicked(self) -> None:
        if self.flow.done:
            self.close()
            return
        self.flow.set_all_up()
        self.refresh()

    def on_skip_clicked(self) -> None:
        self.app_actions.update_settings({"ui.setup_done": True})
        self.close()

    def on_proposal_clicked(self, button: object) -> None:
        for row in self.rows.values():
            if row.radio is button:
                self.flow.choose(row.proposal)

    def on_browse_clicked(self) -> None:
        path = self.choose_folder(self, start_dir(self.state.folders))
        if path:
            self.flow.use_folder(path)

    def on_simulate_clicked(self) -> None:
        def restart(result: CallResult) -> None:
            if result.ok:  # the simulator is read when the daemon starts
                self.app_actions.restart_daemon()

        self.app_actions.update_settings({"gpu.simulate_gpus": 2}, then=restart)

    def on_fix(self, fix: Fix) -> None:
        if fix.action == LOCAL_FOLDER:
            self.flow.errors.pop("model", None)
            self.on_browse_clicked()
        elif fix.action == INSTALL_ENGINE:
            self.flow.retry("engine")
        else:
            self.run_fix(fix)
        self.refresh()

    def closeEvent(self, event: QCloseEvent) -> None:
        event.accept()  # what runs (an install, a download, a start) goes on in the daemon
