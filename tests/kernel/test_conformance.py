"""jupyter_kernel_test's protocol suite against txkernel, once over tcp and
once over ipc (Colab's transport). Every sample attribute the suite supports is
filled, so no test is skipped."""
import os, sys, unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jupyter_kernel_test as jkt  # noqa: E402
import txk_util  # noqa: E402

VERSION_TEXT = "txkernel 0.1.0 (Jupyter protocol 5.3)"


class _Samples:
    language_name = "txkernel"
    file_extension = ".txk"
    code_hello_world = "%echo hello, world"
    code_stderr = "%echo --stderr something went to stderr"
    completion_samples = [
        {"text": "%ech", "matches": {"%echo"}},
        {"text": "%txhe", "matches": {"%txhelp"}},
        {"text": "%lsm", "matches": {"%lsmagic"}},
        {"text": "%%ec", "matches": {"%%echo"}},
        {"text": "%lsmagic\n%cl", "matches": {"%clear"}},
    ]
    complete_code_samples = ["%echo hi", "%lsmagic\n%txversion", "%%echo\nbody\n", "?echo", "# note\n%clear", ""]
    incomplete_code_samples = ["%%echo", "%%echo\nbody", "%echo one \\"]
    invalid_code_samples = ["%nosuchmagic", "model: bert-base-cased", "%%txversion\nx\n", "%echo a\n%%echo b"]
    code_page_something = "?echo"
    code_generate_error = "%nosuchmagic"
    code_execute_result = [{"code": "%txversion", "result": VERSION_TEXT},
                           {"code": "%txversion", "mime": "application/vnd.txkernel.version+json"}]
    code_display_data = [{"code": "%lsmagic", "mime": "text/html"},
                         {"code": "%echo --display d1 shown", "mime": "text/plain"}]
    code_history_pattern = "%txver*"
    supported_history_operations = ("tail", "range", "search")
    code_inspect_sample = "%sleep"
    code_clear_output = "%echo before\n%clear"


class _OnTransport(_Samples, jkt.KernelTests):
    transport = "tcp"

    @classmethod
    def setUpClass(cls):
        cls.kernel_name = txk_util.dev_kernel_name()
        cls.km, cls.kc = txk_util.start(cls.transport)

    @classmethod
    def tearDownClass(cls):
        txk_util.stop(cls.km, cls.kc)


class TestTcp(_OnTransport):
    transport = "tcp"


class TestIpc(_OnTransport):
    transport = "ipc"


class TestIopubWelcome(jkt.IopubWelcomeTests):
    """JEP 65: an XPUB iopub answers each subscription with iopub_welcome."""
    support_iopub_welcome = True

    @classmethod
    def setUpClass(cls):
        cls.kernel_name = txk_util.dev_kernel_name()
        super().setUpClass()


del _OnTransport  # only the concrete transports run

if __name__ == "__main__":
    unittest.main()
