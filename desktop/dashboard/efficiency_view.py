"""The GPUs page's efficiency profiles: Quiet, Eco, Max and the user's own (each a power limit,
an SM clock lock and a fan curve), the one in force on each GPU, and Apply, which puts the chosen
one on every GPU through the daemon and traylm-gpud. The daemon checks a profile against every
card before it writes anything, so a refused one leaves the GPUs as they were; its reason is
said here. The thermal guard still wins over any profile."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from desktop.daemon.messages import CallResult
from desktop.dashboard.page import PageContext
from desktop.widgets.result_label import ResultLabel

REFUSED_BEFORE_WRITING = frozenset(
    {
        "config_invalid",
        "gpu_not_found",
        "power_limit_invalid",
        "clock_lock_invalid",
        "fan_curve_invalid",
    }
)
"""The daemon's refusals that come before its first write to a GPU (engines/gpu/routes.py
resolves and checks the profile on every card first)."""


class EfficiencyView(QGroupBox):
    def __init__(self, ctx: PageContext, parent: QWidget | None = None) -> None:
        super().__init__("Efficiency profile", parent)
        self.ctx = ctx
        self.chosen = False  # the user picked another profile than the one in force
        self.applying = False
        layout = QVBoxLayout(self)
        row = QHBoxLayout()
        self.picker = QComboBox()
        self.picker.setObjectName("efficiencyPicker")
        self.picker.activated.connect(self.on_picked)
        self.picker.currentIndexChanged.connect(self._show_description)
        self.apply_button = QPushButton("Apply to every GPU")
        self.apply_button.setObjectName("applyEfficiency")
        self.apply_button.clicked.connect(self.on_apply_clicked)
        row.addWidget(self.picker, 1)
        row.addWidget(self.apply_button)
        layout.addLayout(row)
        self.description = QLabel("")
        self.description.setObjectName("efficiencyDescription")
        self.description.setWordWrap(True)
        layout.addWidget(self.description)
        self.in_force = QLabel("")
        self.in_force.setObjectName("efficiencyInForce")
        self.in_force.setWordWrap(True)
        layout.addWidget(self.in_force)
        self.problems = ResultLabel("efficiencyProblems")
        layout.addWidget(self.problems)
        self.result = ResultLabel("efficiencyResult")
        layout.addWidget(self.result)
        gpu = ctx.state.gpu
        gpu.efficiency_changed.connect(self.refresh)
        gpu.overview_changed.connect(self.refresh)
        self.refresh()

    # ----------------------------------------------------------------- state → widgets

    def refresh(self) -> None:
        gpu = self.ctx.state.gpu
        ef = gpu.efficiency
        self.setVisible(gpu.available and ef is not None)
        if ef is None:
            return
        names = [p.name for p in ef.profiles]
        if names != [self.picker.itemText(i) for i in range(self.picker.count())]:
            keep = self.picker.currentText()
            self.picker.blockSignals(True)
            self.picker.clear()
            for p in ef.profiles:
                self.picker.addItem(p.name)
                self.picker.setItemData(
                    self.picker.count() - 1, p.description, Qt.ItemDataRole.ToolTipRole
                )
            self.picker.blockSignals(False)
            if keep in names:
                self.picker.setCurrentIndex(names.index(keep))
        in_force = gpu.profile_in_force()
        if in_force in names and not (self.chosen or self.applying):
            self.picker.setCurrentIndex(names.index(in_force))
        self._show_description()
        self.in_force.setText(self._in_force_text())
        if ef.problems:
            self.problems.warning(
                "These profile files cannot be used until they are fixed: "
                + " · ".join(ef.problems)
            )
        else:
            self.problems.neutral("")
        self._update_button()

    def _in_force_text(self) -> str:
        gpu = self.ctx.state.gpu
        ef = gpu.efficiency
        assert ef is not None
        infos = gpu.infos()
        common = gpu.profile_in_force()
        if common is not None:
            every = "both GPUs" if len(infos) == 2 else f"all {len(infos)} GPUs"
            return f"In force: {common} on {'the GPU' if len(infos) == 1 else every}."
        parts = [f"GPU {i.index}: {ef.in_force.get(i.uuid) or 'none'}" for i in infos]
        if not any(i.uuid in ef.in_force for i in infos):
            return "No profile in force: the GPUs run with the card's settings or your own."
        return "In force: " + ", ".join(parts) + "."

    def _show_description(self, *_: object) -> None:
        ef = self.ctx.state.gpu.efficiency
        name = self.picker.currentText()
        text = next((p.description for p in ef.profiles if p.name == name), "") if ef else ""
        self.description.setText(text)
        self.picker.setToolTip(text)

    def _update_button(self) -> None:
        ov = self.ctx.state.gpu.overview
        helper = ov is not None and ov.helper.available
        self.apply_button.setEnabled(
            helper and bool(self.picker.currentText()) and not self.applying
        )
        self.apply_button.setToolTip(
            "" if helper else "Needs the GPU helper (traylm-gpud): see Fans & power"
        )

    # ----------------------------------------------------------------- daemon

    def on_picked(self, _index: int) -> None:
        self.chosen = self.picker.currentText() != self.ctx.state.gpu.profile_in_force()

    def on_apply_clicked(self) -> None:
        name = self.picker.currentText()
        if not name:
            return
        count = len(self.ctx.state.gpu.infos())
        simulated = " simulated" if self.ctx.state.gpu.simulated else ""

        def done(result: CallResult) -> None:
            self.applying = False
            if result.ok:
                self.chosen = False
                gpus = f"{count}{simulated} GPU" + ("" if count == 1 else "s")
                self.result.ok(f"{name} is in force on {gpus}.")
            elif result.error_code in REFUSED_BEFORE_WRITING:
                self.result.error(
                    f"{name} was not applied; the GPUs are as they were: {result.error}"
                )
            else:
                self.result.error(
                    f"{name} was not applied in full; a GPU that refused a step is back at its "
                    f"defaults: {result.error}"
                )
            self.ctx.actions.reload_efficiency()
            self._update_button()

        self.applying = True
        self._update_button()
        self.result.neutral(f"Applying {name}…")
        self.ctx.bridge.call(lambda c: c.set_efficiency_profile(name), done)
