#include "ampc/status.h"
int main(void){return 0;}
