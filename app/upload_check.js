// Files larger than --max-upload are refused in the page, before a byte is sent: the status line says which
// and by how much, in binary units (Gradio's own check shows a bare "Error" and "256.0 Mb").
(() => {
  const limit = MAX_UPLOAD_BYTES;
  // byte_units.format_bytes in JavaScript: the sizes the server's messages and the meters say, to the digit.
  const size = (n) => {
    if (n < 1024) return `${n} B`;
    let value = n;
    for (const unit of ["KiB", "MiB", "GiB", "TiB"]) {
      value /= 1024;
      if (Math.round(value * 100) / 100 < 1024 || unit === "TiB") return `${value.toFixed(2)} ${unit}`;
    }
  };
  const refuse = (files) => {
    const big = Array.from(files || []).filter((file) => file.size > limit);
    if (!big.length) return false;
    const text = big.map((file) => `${file.name} is ${size(file.size)}`).join("; ") +
      `, larger than the ${size(limit)} this app accepts (--max-upload). Nothing was uploaded.`;
    const line = document.querySelector("#status .status");
    if (line) {
      line.className = "status status-error";
      line.dataset.kind = "error";
      line.textContent = text;
    }
    return true;
  };
  const inDrop = (target) => target instanceof Element && target.closest("#file-drop");
  document.addEventListener("change", (event) => {
    const input = event.target;
    if (!(input instanceof HTMLInputElement) || input.type !== "file" || !inDrop(input)) return;
    if (refuse(input.files)) {
      event.stopImmediatePropagation();
      input.value = "";
    }
  }, true);
  document.addEventListener("drop", (event) => {
    if (inDrop(event.target) && event.dataTransfer && refuse(event.dataTransfer.files)) {
      event.stopImmediatePropagation();
      event.preventDefault();
    }
  }, true);
})();
