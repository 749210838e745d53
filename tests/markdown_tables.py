"""Reading back the markdown tables benchmark scripts print (the smoke tests check their rows)."""
from typing import Dict, List, Sequence


def markdown_table(lines: Sequence[str], first_cell: str) -> List[Dict[str, str]]:
    """The rows (header cell -> cell) of the first table whose header row starts with `first_cell`."""
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_cell} |"))
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("| "):
            break
        rows.append(dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")))))
    return rows
