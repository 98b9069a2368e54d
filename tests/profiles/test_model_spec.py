"""`MODULE:FUNCTION` and `path/file.py:FUNCTION` model builders."""

import pytest

from omnikeras.profiles.model_spec import REFERENCE, load_builder


def test_a_module_function_and_a_file_function_load(tmp_path) -> None:
    assert load_builder(REFERENCE).__name__ == "reference_cnn"
    script = tmp_path / "train.py"
    script.write_text("def build():\n    return 'model'\nif __name__ == '__main__':\n    raise SystemExit('ran main')\n")
    assert load_builder(f"{script}:build")() == "model"


@pytest.mark.parametrize("spec, message", [
    ("no_colon", "MODULE:FUNCTION"),
    ("omnikeras.profiles.reference_cnn:nothing", "no function 'nothing'"),
    ("/no/such/file.py:build", "no Python file"),
])
def test_bad_specs_are_refused(spec, message) -> None:
    with pytest.raises(ValueError, match=message):
        load_builder(spec)
